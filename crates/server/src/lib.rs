//! phoenix-server (under construction).
