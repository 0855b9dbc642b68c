"""Platform PKI: the CA that signs switch certificates, the CRL and job tokens (see ca.py)."""
