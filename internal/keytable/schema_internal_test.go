package keytable

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// texts are a Store's statement texts by field name (list's by status and page).
func texts(st *Store) map[string]string {
	out := map[string]string{}
	for _, v := range []reflect.Value{reflect.ValueOf(st.sql), reflect.ValueOf(st.admin)} {
		for i := range v.NumField() {
			name, f := v.Type().Field(i).Name, v.Field(i)
			if f.Kind() == reflect.String {
				out[name] = f.String()
			}
		}
	}
	pipe := reflect.ValueOf(st.pipe) // pipeline.go's, whose names repeat sql.go's
	for i := range pipe.NumField() {
		if pipe.Field(i).Kind() != reflect.String {
			continue // not a statement (the isolation flag)
		}
		out["pipe "+pipe.Type().Field(i).Name] = pipe.Field(i).String()
	}
	for status, pages := range st.admin.list {
		out["list "+status+" first"], out["list "+status+" later"] = pages[0], pages[1]
	}
	return out
}

func TestStatementsInSchema(t *testing.T) {
	t.Parallel()
	def := texts(New())
	require.Equal(t, sqlLookup, def["lookup"], "the default store sends the texts of sql.go as they are")
	require.Equal(t, sqlClaimLock, def["claimLock"])

	st, err := newInSchema(`my "odd" schema's`)
	require.NoError(t, err)
	const table = `"my ""odd"" schema's"."idemflow_keys"`
	const lockTable = `'"my ""odd"" schema''s"."idemflow_keys"'::regclass`
	got := texts(st)
	require.Len(t, got, len(def))
	require.Greater(t, len(got), 20, "the admin statements are covered too")
	for name, sql := range got {
		require.NotEmpty(t, sql, name)
		require.True(t, strings.Contains(sql, table) || strings.Contains(sql, lockTable), "%s names the schema", name)
		bare := strings.ReplaceAll(strings.ReplaceAll(sql, lockTable, ""), table, "")
		require.NotContains(t, bare, "idemflow_keys", "%s names the key table without its schema", name)
		if strings.Contains(def[name], "regclass") {
			require.Contains(t, sql, lockTable, "%s: the claim lock mixes in the schema's table", name)
		}
	}

	for _, bad := range []string{strings.Repeat("s", 64), "a\x00b"} {
		_, err := newInSchema(bad)
		require.Error(t, err)
	}
}
