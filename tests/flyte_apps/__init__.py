"""Small flows used by the Flyte-surface tests (module-level tasks, as a container needs them)."""
