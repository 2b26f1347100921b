pub mod random_wire;
