"""TF Serving's REST API: `codec.py` its shapes (pure functions), `routes.py` its routes."""
