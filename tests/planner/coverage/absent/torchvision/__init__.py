"""An importable torchvision for generate.py's recorder only (vLLM's multimodal modules import its image transforms at module level); see _placeholder.py."""
from _placeholder import install

install(__name__, globals())
