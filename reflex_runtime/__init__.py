"""reflex-runtime: a cold-start-first GGUF inference runtime for serverless GPU functions.

Import nothing heavy here: `reflex` starts by importing this package, and every
millisecond before the first token counts.
"""

__version__ = "0.1.0"
