"""The CDK app (DESIGN.md §1): app.py (environment values only), constructs/ (reusable), stacks/."""
