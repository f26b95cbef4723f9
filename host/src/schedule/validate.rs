//! Validation: proves a schedule can run (to be written).
