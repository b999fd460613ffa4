"""CloudWatch metric names (shared by the publishers and the CDK dashboard) and the PutMetricData publisher
(docs/deploy.md)."""
