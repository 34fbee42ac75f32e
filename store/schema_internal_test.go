package store

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// texts are a Store's statement texts by field name.
func texts(st statements) map[string]string {
	out := map[string]string{}
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		out[v.Type().Field(i).Name] = v.Field(i).String()
	}
	return out
}

func TestStatementsInSchema(t *testing.T) {
	t.Parallel()
	def := texts(New().sql)
	require.Equal(t, sqlLookup, def["lookup"], "the default store sends the texts of sql.go as they are")
	require.Equal(t, sqlClaimLock, def["claimLock"])

	st, err := NewInSchema(`my "odd" schema's`)
	require.NoError(t, err)
	const table = `"my ""odd"" schema's"."idemflow_keys"`
	const lockTable = `'"my ""odd"" schema''s"."idemflow_keys"'::regclass`
	for name, sql := range texts(st.sql) {
		require.NotEmpty(t, sql, name)
		require.True(t, strings.Contains(sql, table) || strings.Contains(sql, lockTable), "%s names the schema", name)
		bare := strings.ReplaceAll(strings.ReplaceAll(sql, lockTable, ""), table, "")
		require.NotContains(t, bare, "idemflow_keys", "%s names the key table without its schema", name)
		if strings.Contains(def[name], "regclass") {
			require.Contains(t, sql, lockTable, "%s: the claim lock mixes in the schema's table", name)
		}
	}

	for _, bad := range []string{strings.Repeat("s", 64), "a\x00b"} {
		_, err := NewInSchema(bad)
		require.Error(t, err)
	}
}
