//! phoenix-proto (under construction).
