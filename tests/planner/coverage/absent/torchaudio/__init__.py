"""An importable torchaudio for generate.py's recorder only (FunASR's module imports it at module level); see _placeholder.py."""
from _placeholder import install

install(__name__, globals())
