//! phoenix-client (under construction).
