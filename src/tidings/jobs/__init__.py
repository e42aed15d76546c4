"""What users write jobs with: the ``Job`` class, retry backoff, job middleware and the
shipped limits (rate limits, overlap locks, exception throttling)."""
