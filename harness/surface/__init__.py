"""The declared surface: what the installed vLLM promises each attention backend supports, per GPU class."""
