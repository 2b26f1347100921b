//! phoenix-meta (under construction).
