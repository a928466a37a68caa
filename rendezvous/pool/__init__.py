"""`ringmaster pool serve`: one pool of hosts lent to many elastic jobs under a scheduling policy."""
