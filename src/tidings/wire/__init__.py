"""The wire format of a job: type-tagged JSON arguments, the signed envelope and
encryption. Nothing here knows what a job class is (:mod:`tidings.jobs.compose` turns a
job into an envelope)."""
