//! Sources on other hosts. [`libpq`] reads a cluster through ordinary connections to its
//! server, with nothing installed on the primary; a pgjet agent will join it behind the same
//! [`crate::transfer::Source`] seam.
pub mod libpq;
