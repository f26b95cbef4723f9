//! The built-in model description: layers, widths, loss; from flags or a TOML/JSON file (to be written).
