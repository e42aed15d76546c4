"""What users write jobs with: the ``Job`` class, retry backoff, job middleware and the
shipped limits (rate limits, overlap locks, exception throttling), and ``compose``, which
turns a job and its options into a signed envelope (:mod:`tidings.wire`)."""
