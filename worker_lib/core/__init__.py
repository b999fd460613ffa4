"""See docs/design.md for what lives here."""
