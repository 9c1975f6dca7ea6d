"""Kubernetes GPU clusters as sellers (issue 37), through the official ``kubernetes`` Python client."""
