"""A subpackage, so discovery must walk into it."""
