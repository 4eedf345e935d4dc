//! The store conformance suite, once per backend.

mod sqlite {
    tickmark_tests::conformance_suite!(tickmark::Backend::Sqlite);
}

mod postgres {
    tickmark_tests::conformance_suite!(tickmark::Backend::Postgres);
}
