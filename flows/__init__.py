"""Prefect flows: `solve-bug` (one task end to end) and `sweep` (many tasks, here or across a work pool).

Import the flows from their modules (`from flows.sweep import sweep`); this package imports nothing itself, so
`import flows.common` stays light.
"""
