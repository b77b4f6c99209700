"""efo: AWS Kinesis Enhanced Fan-Out consumer that hands records to a PySpark driver as DataFrames."""

import importlib.metadata

try:
    __version__ = importlib.metadata.version("efo")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
