"""winport: DeepSeek-V4.x on SGLang + kt-kernel, natively on Windows.

Kept import-light (standard library only): the installer and the interpreter-start bootstrap
import this package before any dependency exists.
"""

__version__ = "0.1.0"
