"""builder: render, compile, prove and publish vLLM / SGLang images."""

__version__ = "0.1.0"
