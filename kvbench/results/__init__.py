"""What a run measured, as data: the results schema and its points, a run's metadata and summary, the
server families' metrics read from an exposition, and the watch timeline's lines. Below ``endpoint/`` and
``report/``, so the load generators and the renderers share one model of a result."""
