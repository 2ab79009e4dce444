"""The Kubernetes API as every part of this driver reads and writes it.

    quantity     Kubernetes quantities (resource.Quantity): exact parsing, the API server's spelling

Nothing here imports the rest of dra_driver: every package may import this one.
"""
