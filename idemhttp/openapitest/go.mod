module github.com/idemflow/idemflow/idemhttp/openapitest

go 1.26.0

require (
	github.com/getkin/kin-openapi v0.153.0
	github.com/idemflow/idemflow v0.0.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/georgysavva/scany/v2 v2.1.4 // indirect
	github.com/go-json-experiment/json v1.27.2 // indirect
	github.com/go-openapi/jsonpointer v0.22.5 // indirect
	github.com/go-openapi/swag/jsonname v0.25.5 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	go.yaml.in/yaml/v4 v4.0.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/idemflow/idemflow => ../..
