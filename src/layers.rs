//! Built-in layers: Linear + bias + fused activation (to be written by the runtime issue).
