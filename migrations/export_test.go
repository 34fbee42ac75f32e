package migrations

// Load exposes load to the external test package, which cannot be package migrations
// itself: it imports testkit/pgtest, which imports this package.
var Load = load

// Statements exposes statements to the external test package.
var Statements = statements
