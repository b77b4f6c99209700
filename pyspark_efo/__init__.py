"""efo as a PySpark Structured Streaming source: ``spark.readStream.format("efo")``.

Spark finds it by itself once efo is installed (``pip install efo[spark]``): its Python data source
lookup imports every top-level module named ``pyspark_*`` and registers the ``DefaultSource`` of
each. No ``spark.dataSource.register`` call and no JAR.

Importing this module must stay cheap and must not fail: Spark imports it in every application on the
machine that uses any Python data source. The source itself is in :mod:`pyspark_efo.reader`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.types import StructType


class DefaultSource(DataSource):
    """Kinesis Data Streams through Enhanced Fan-Out, read by efo on the driver. Its options are
    checked here, at ``load()``: a bad one fails before the query starts, naming it."""

    def __init__(self, options: Any) -> None:
        from efo.source.options import parse

        super().__init__(options)
        self.source_options = parse(options)

    @classmethod
    def name(cls) -> str:
        return "efo"

    def schema(self) -> StructType:
        from pyspark_efo.schema import SCHEMA

        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pyspark_efo.reader import EfoStreamReader
        from pyspark_efo.schema import check_schema

        check_schema(schema)
        return EfoStreamReader(self.source_options)


__all__ = ["DefaultSource"]
