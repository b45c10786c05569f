"""TLS material for the webhooks: a CA and a serving certificate it signs (``cryptography`` only)."""
