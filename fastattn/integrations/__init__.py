"""Bridges to other libraries, each imported only when used:
:mod:`fastattn.integrations.transformers` (Hugging Face ``transformers``)."""
