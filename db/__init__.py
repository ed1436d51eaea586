"""The database layer: models, engine and sessions, the job state machine, migrations."""
