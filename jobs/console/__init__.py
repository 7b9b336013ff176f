"""The web console: jobs/console/app.py (docs/console.md)."""
