"""The semantic cache's offline side: fitting and calibrating the verifier that tokenomy/cache/hit_verifier.py loads."""
