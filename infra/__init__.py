"""This repository's CDK app: ``app.py`` (environment values only) and ``stacks/``, built on ``worker_lib.cdk``."""
