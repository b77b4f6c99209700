# efo: Kinesis Enhanced Fan-Out -> PySpark. Runs as a non-root user with a read-only root
# filesystem; the only writable place is /tmp (an emptyDir in the Helm chart).
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install --yes --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY efo ./efo
COPY sparkbridge ./sparkbridge
RUN pip install --no-cache-dir -c constraints.txt '.[spark]' \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin efo

ENV HOME=/tmp \
    SPARK_LOCAL_DIRS=/tmp \
    PYSPARK_PYTHON=python3 \
    EFO_LOG__FORMAT=json \
    EFO_METRICS_PORT=9400
USER 10001
EXPOSE 9400

# tini reaps zombies and forwards SIGTERM to its child only (no -g): the Python driver receives
# the signal, drains and checkpoints, and stops the JVM itself. A signal to the whole process
# group would kill the JVM before the drain. Exec form, so no shell sits in between.
ENTRYPOINT ["/usr/bin/tini", "--", "efo"]
CMD ["run"]
