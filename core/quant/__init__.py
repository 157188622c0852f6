"""Weight quantization for CPU decode: the int4 / int8 weight stand-ins, and `model.quantization`'s
auto resolution."""
