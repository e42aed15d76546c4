"""The wire format of a job: type-tagged JSON arguments, the signed envelope, encryption,
and composing a job's body from its options."""
