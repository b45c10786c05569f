"""Ratio reconcilers (issue 5): they will keep the ratio annotations the webhooks read up to date."""
