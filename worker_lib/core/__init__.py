"""What every area shares: the clock, the error hierarchy, the models, environment helpers, AWS settings and
client helpers, optional-dependency checks (docs/design.md, "Errors" and "Clock")."""
