"""What every part of Ringmaster shares: errors, logging and structured events, reconnecting."""
