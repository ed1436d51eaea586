"""The HTTP submit/poll service. It never imports TensorFlow: signatures come from the database."""
