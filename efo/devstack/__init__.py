"""Local AWS development stack: kinesis-local behind an AWS-conformance proxy, plus moto for DynamoDB."""
