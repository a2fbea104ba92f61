"""t10c: a compiler for inter-core-connected AI chips, after T10 (SOSP 2024).

The pipeline, one stage per subpackage::

    ONNX --frontend--> Graph --partition--> Plan --codegen--> Program --emulator--> outputs
"""

__version__ = "0.1.0"
