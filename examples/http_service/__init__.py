"""The small HTTP customer lookup service used by the HTTP examples and benchmark."""
