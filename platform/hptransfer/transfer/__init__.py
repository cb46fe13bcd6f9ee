"""The transfer engine: sweep evidence → per-width optima → a rule → a plan for the target."""
