# efo: Kinesis Enhanced Fan-Out -> PySpark. Runs as a non-root user with a read-only root
# filesystem; the only writable place is /tmp (an emptyDir in the Helm chart).
#
# The base image is pinned by digest, so a rebuild gets the same OS and Python until the pin is
# moved on purpose. BASE_IMAGE is python:3.11-slim-bookworm (Python 3.11.16, Debian 12) as
# published on 2026-09-19: the digest of its multi-platform OCI index, as listed in Docker's
# docker-library/repo-info (repos/python/remote/3.11-slim-bookworm.md). To move it:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # the "Digest:" line of the index
# put that digest here, rebuild, and run `make test` (tests/unit/test_dockerfile.py checks the form).
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

# s3a:// sinks need hadoop-aws of exactly the Hadoop version inside the installed pyspark (its
# pyspark/jars/hadoop-client-api-<version>.jar), plus the AWS SDK v2 bundle and the analytics
# accelerator that this hadoop-aws depends on (its Maven POM). Each jar is checked against the SHA-1
# that Maven Central publishes beside it (<jar>.sha1); a mismatch fails the build.
# tests/unit/test_dockerfile.py keeps HADOOP_VERSION equal to the installed pyspark's Hadoop.
FROM ${BASE_IMAGE} AS s3a-jars
ARG MAVEN=https://repo1.maven.org/maven2
ARG HADOOP_VERSION=3.5.0
ARG HADOOP_AWS_SHA1=9e594525d264c0db653c7f68da98b245f7d61ea5
ARG AWS_SDK_BUNDLE_VERSION=2.35.4
ARG AWS_SDK_BUNDLE_SHA1=7252265e3970b214708e68a8b74a8fa8c875af1e
ARG ANALYTICS_ACCELERATOR_VERSION=1.3.1
ARG ANALYTICS_ACCELERATOR_SHA1=6c9bd0f6c440c9a78e82d272f5f0252d942419f6
RUN apt-get update \
 && apt-get install --yes --no-install-recommends curl ca-certificates \
 && mkdir /jars && cd /jars \
 && curl -fsSLO "${MAVEN}/org/apache/hadoop/hadoop-aws/${HADOOP_VERSION}/hadoop-aws-${HADOOP_VERSION}.jar" \
 && curl -fsSLO "${MAVEN}/software/amazon/awssdk/bundle/${AWS_SDK_BUNDLE_VERSION}/bundle-${AWS_SDK_BUNDLE_VERSION}.jar" \
 && curl -fsSLO "${MAVEN}/software/amazon/s3/analyticsaccelerator/analyticsaccelerator-s3/${ANALYTICS_ACCELERATOR_VERSION}/analyticsaccelerator-s3-${ANALYTICS_ACCELERATOR_VERSION}.jar" \
 && printf '%s  %s\n' \
      "${HADOOP_AWS_SHA1}" "hadoop-aws-${HADOOP_VERSION}.jar" \
      "${AWS_SDK_BUNDLE_SHA1}" "bundle-${AWS_SDK_BUNDLE_VERSION}.jar" \
      "${ANALYTICS_ACCELERATOR_SHA1}" "analyticsaccelerator-s3-${ANALYTICS_ACCELERATOR_VERSION}.jar" \
    | sha1sum --check --strict -

FROM ${BASE_IMAGE}

RUN apt-get update \
 && apt-get install --yes --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY efo ./efo
COPY sparkbridge ./sparkbridge
RUN pip install --no-cache-dir -c constraints.txt '.[spark]' \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin efo
# Straight into pyspark's own jars: on the classpath of every session, nothing to configure.
COPY --from=s3a-jars /jars/ /usr/local/lib/python3.11/site-packages/pyspark/jars/

ENV HOME=/tmp \
    SPARK_LOCAL_DIRS=/tmp \
    PYSPARK_PYTHON=python3 \
    EFO_LOG__FORMAT=json \
    EFO_METRICS_PORT=9400
USER 10001
EXPOSE 9400

# /healthz on the metrics port: the event loop answers and no owned task died. Spark starts in
# 10-20 s, hence the start period. Exec form: no shell in the image's health path either.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('EFO_METRICS_PORT', '9400') + '/healthz', timeout=4)"]

# tini reaps zombies and forwards SIGTERM to its child only (no -g): the Python driver receives
# the signal, drains and checkpoints, and stops the JVM itself. A signal to the whole process
# group would kill the JVM before the drain. Exec form, so no shell sits in between.
ENTRYPOINT ["/usr/bin/tini", "--", "efo"]
CMD ["run"]
