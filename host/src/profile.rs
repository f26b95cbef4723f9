//! `profile`: to be written (see the issue that owns it).
