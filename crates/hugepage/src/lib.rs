//! HPS
