"""Per-request decoding: parameters, canvas geometry, unmasking rules, early stop."""
