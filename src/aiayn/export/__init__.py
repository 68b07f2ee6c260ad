"""Export a trained checkpoint to a deployment engine: `python -m aiayn.export` (CTranslate2)."""
