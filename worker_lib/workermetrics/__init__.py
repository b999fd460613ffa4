"""See DESIGN.md §1 for what lives here."""
