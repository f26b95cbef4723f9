//! `runtime`: executes any valid schedule on devices (to be written).
